"""Mixed precision: the dtypes every FSDP unit (or a DDP model) really uses, planned and seen."""
