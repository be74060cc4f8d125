"""The model runtime: loading and sampling models (in process or served), long-answer decoding, the
student's builders, SFT, adapters, weight hooks and merges, launching on several processes, and
checkpoints."""
