"""The report labeler's version, apart from the labeler so that the definitions name it
without importing spaCy."""

# Bumped whenever a rule or a phrase list changes: it keys the stored report labels and is
# part of the report_labels asset's code version.
LABELER_VERSION = "report-rules-2"
