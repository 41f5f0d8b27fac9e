"""`make bench`: treemail throughput and latency next to a raw Redis baseline measured in the same run."""
