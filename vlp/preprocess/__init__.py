"""Preprocessing, the same for training, evaluation and inference: opening images
(:mod:`~vlp.preprocess.images`), the image transforms, caption cleaning and the tokenizer
(:mod:`~vlp.preprocess.transforms`), and the training decoders: JPEG draft decoding per crop
(:mod:`~vlp.preprocess.draft`) and decoding on the training device
(:mod:`~vlp.preprocess.device_decode`). Below the data layer: datasets use it, it reads no
annotation file."""
