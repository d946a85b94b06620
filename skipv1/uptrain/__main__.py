"""`python -m skipv1.uptrain RECIPE [key=value ...]`: the per-rank entry point used by
`skipv1 uptrain --nproc N`, and usable directly under torchrun or the DeepSpeed launcher."""

import sys

from .launch import die_with_launcher

if __name__ == "__main__":
    die_with_launcher()  # first: before the imports, a window where the launcher could die
    from ..cli import app

    app(args=["uptrain", *sys.argv[1:]], prog_name="skipv1")
