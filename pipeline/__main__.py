"""Entry point: `python -m pipeline JOB ...`, or `spark-submit --py-files pipeline.zip pipeline/__main__.py JOB ...`."""

import sys

from pipeline.cli import main

if __name__ == "__main__":
    sys.exit(main())
