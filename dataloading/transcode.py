"""`python -m dataloading.transcode`: the reference's name for `python transcode.py`."""
import sys

from transcode import main

if __name__ == "__main__":
    sys.exit(main())
