"""NVIDIA's DLRM_and_DCNv2 names for the data tools (`python -m dataloading.<tool>`): each
module is a thin entry point into the tool of the same name at the repository root."""
