"""`python -m skipv1.uptrain RECIPE [key=value ...]`: the per-rank entry point used by
`skipv1 uptrain --nproc N`, and usable directly under torchrun or the DeepSpeed launcher."""

import sys

from ..cli import app

if __name__ == "__main__":
    app(args=["uptrain", *sys.argv[1:]], prog_name="skipv1")
