"""vlp: ALBEF-style vision-language pretraining, fine-tuning and evaluation."""

__version__ = "0.1.0"
