"""The old command line of the per-format benchmark, now the `formats` section of
bench_images.py (image_formats.py holds it): the same arguments, run there.

    .venv/bin/python benchmarks/bench_formats.py [--keep DIR] [--repeats 2] [--scale 1.0]
        [--only png16-rex,dicom] [--smoke]
    # is  .venv/bin/python benchmarks/bench_images.py --sections formats [the same]
"""

import os
import sys
from pathlib import Path

if __name__ == "__main__":
    images = Path(__file__).with_name("bench_images.py")
    arguments = [sys.executable, str(images), "--sections", "formats", *sys.argv[1:]]
    os.execv(sys.executable, arguments)
