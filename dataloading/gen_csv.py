"""`python -m dataloading.gen_csv`: the reference's name for `python gen_csv.py`."""
import sys

from gen_csv import main

if __name__ == "__main__":
    sys.exit(main())
