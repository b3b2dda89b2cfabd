"""The asset groups of the lineage graph, in the order data flows through them, and the
selections the jobs and the automation make of them."""

import dagster as dg

# The downloads as observed (data versions of every partition's files).
SOURCES = "sources"
# What the datasets' own files say, per partition: the index, labels, masks and boxes.
ANNOTATIONS = "annotations"
# Decoded and resized images, per partition.
PIXELS = "pixels"
# Tables and pictures over the partitions: the manifest, near duplicates and the profiles.
CORPUS = "corpus"
# Where every image came from in its parent dataset (NIH ChestX-ray14, CheXpert, MIMIC-CXR).
PARENTS = "parents"
# What is handed to other tools: Hugging Face / WebDataset shards and the dataset card.
PUBLISHING = "publishing"

# The one per-partition asset of the corpus group: a partition's own profile.
PARTITION_PROFILE = dg.AssetSelection.assets("partition_profile")

# Every stage of one partition.
PARTITION_STAGES = dg.AssetSelection.groups(ANNOTATIONS, PIXELS) | PARTITION_PROFILE

# The joins over every materialized partition, rebuilt once the partitions settle.
CORPUS_JOINS = dg.AssetSelection.groups(CORPUS, PARENTS) - PARTITION_PROFILE
