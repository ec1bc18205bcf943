"""`python -m dataloading.generate_feature_spec`: the reference's name for `python generate_feature_spec.py`."""
import sys

from generate_feature_spec import main

if __name__ == "__main__":
    sys.exit(main())
