"""Criteo preprocessing: raw click logs -> split-binary dataset (see preproc/README.md)."""
