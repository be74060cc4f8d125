"""Prompts and training rows: the sources a pool is built from, the record they travel as,
n-gram decontamination, and the SFT conversations checked before training."""
