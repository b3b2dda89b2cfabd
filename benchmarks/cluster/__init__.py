"""The sections of bench_cluster.py too long to sit in it: the `images` stage on Dask and the
time limit's cost (throughput.py), the S3 requests of the `images` step (requests.py), a large
upload (upload.py), and the Dask and S3 processes they start (services.py)."""
