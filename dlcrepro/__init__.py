"""dlcrepro: reproduce the training–inference mismatch study (discrepancy-lag correction)."""

__version__ = "0.1.0"
