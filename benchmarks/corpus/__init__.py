"""The parts of bench_corpus.py: the corpus (generation.py), the cost of a step
(sampling.py), the UI pages' timing (browser.py) and the figures kept and printed (report.py).

Per size it writes the four datasets (CheXlocalize, MS-CXR over MIMIC-CXR and ChestX-Det at
their documented counts whatever the size; ReXGradient and an NIH ChestX-ray14 parent at the
size's share of 273,004 and 112,120 films, rendered in parallel by the project's renderer as
distinct, look-alike radiographs of about `--side` pixels), then runs, each as its own
command under `/usr/bin/time`: a stat of each ReXGradient train image by coreutils (the
disk's own cost of finding them, beside the steps that do), check-data, the observation job,
every partition's `all_stages`, the corpus joins (`manifest`), every partition's `exports`,
the card and `radharmony verify`; at the largest size, ReXGradient train's re-runs
(unchanged, 1 % of its sources changed, and resumed after a kill -9 halfway through a first
build). Run as root, it drops the page cache before each of those commands but the re-runs
(which follow the builds as a user's next launch does), so every size meets its files as a
user's first command after a download does (otherwise N/4 would be read from memory and N
partly from the disk). It prints per step: wall, CPU (busy CPU seconds of the machine while
the step runs: the rehearsal runs alone, and pool workers forked by a fork server are never
the command's reaped children), peak RSS, the bytes it added under the output root, the
reads the disk completed (on a cold cache a step's wall is its reads times the disk's
latency, which varies over the day on this machine) and the pages the kernel reclaimed (what
a step writing more than the free memory holds pays), with the seconds of each stage of a
launched job (from the instance); then near_duplicates' time and hash pairs per size with a
projection to 1,000,000 images, and the marginal cost per image between sizes, per step and
per stage. The datasets written whole are rendered once (`--work`/whole_datasets) and
hard-linked into each size; each size's figures and its commands' output are kept
(`--work`/steps_n*.json, .log), so sizes run by separate commands combine. Everything lives
under `--work` (up to about 60 GB at the full count with `--side 192`: the render, N's outputs
and train's second build, for which N's measured exports are deleted). Every pass over a size
starts from an empty output root and instance (a step chosen by `--step` is a first build and
needs what it reads chosen too: every `all_stages` before `manifest`) and deletes them after,
unless `--keep`; a size's data go after its last pass. With `--passes K` the sizes are run K
times, in turn (N/4, N/2, N, N, N/2, N/4, …), and each step's figures are its medians, with the
range of each ratio over the passes: on this machine one cold step's wall moves by tens of
percent between runs.

    .venv/bin/python benchmarks/bench_corpus.py --work /tmp/rehearsal
    .venv/bin/python benchmarks/bench_corpus.py --work /tmp/r --fractions 0.02 --side 512
    .venv/bin/python benchmarks/bench_corpus.py --work /tmp/rehearsal --step check-data \
        --step "all_stages rexgradient"      # a few steps again, on the corpus already written
    .venv/bin/python benchmarks/bench_corpus.py --work /tmp/rehearsal --passes 3 --step check-data
    .venv/bin/python benchmarks/bench_corpus.py --smoke   # the report on made-up figures

It is a benchmark, not a test (most of an hour at the full count on 2 cores).
"""
