"""`python -m dataloading.transcribe`: the reference's name for `python transcribe.py`."""
import sys

from transcribe import main

if __name__ == "__main__":
    sys.exit(main())
