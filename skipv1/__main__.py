"""`python -m skipv1 ...` runs the command line, as the `skipv1` script does."""

from .cli import app

app()
