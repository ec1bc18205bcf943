"""NVIDIA's `preprocessing/parquet_to_tfrecord.py` command line: sim.preproc.parquet_to_tfrecord."""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from sim.preproc.parquet_to_tfrecord import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
