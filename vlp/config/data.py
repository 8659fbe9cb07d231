"""Data configs of pretraining: annotation files and loaders, train-time image augmentation, and the
bad-sample policy shared with fine-tuning's data section."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from vlp.config.load import check_choice
from vlp.errors import ConfigError
from vlp.remote.url_credentials import refusal

# ----------------------------------------------------------------------------- data


@dataclass
class ImageConfig:
    """Train-time augmentation (ALBEF §8). Test time is always Resize((res, res), bicubic)."""

    crop_scale: Optional[list[float]] = field(default_factory=lambda: [0.2, 1.0])  # None: no crop
    hflip: bool = True
    randaugment: bool = True
    mean: list[float] = field(default_factory=lambda: [0.48145466, 0.4578275, 0.40821073])
    std: list[float] = field(default_factory=lambda: [0.26862954, 0.26130258, 0.27577711])
    # Training loader ships uint8 images, normalised on the device (pretraining; evaluation
    # transforms always normalise in the loader).
    uint8: bool = False
    # How the training loader decodes images (pretraining): full, or draft: the crop box is drawn
    # first (the same box as full), then a JPEG is decoded at 1/2, 1/4 or 1/8 size where that crop
    # still has both sides >= the model's resolution (vlp/preprocess/draft.py). Pixels change slightly
    # (the decoder's downscaling), crop boxes do not; other files and small JPEGs decode as full.
    # device: the loader draws full's crop boxes, flips and RandAugment ops but ships a JPEG's bytes
    # undecoded; the task decodes the batch's JPEGs in one torchvision decode_jpeg call on the
    # training device (nvJPEG on CUDA) and augments them there with tensor ops (pixels close to
    # full's, not equal); other files decode on the host, as full. Needs uint8=true
    # (vlp/preprocess/device_decode.py).
    decode: str = "full"  # full | draft | device

    def __post_init__(self) -> None:
        check_choice("data.image.decode", self.decode, ["full", "draft", "device"])


@dataclass
class BadSampleConfig:
    """Samples whose image cannot be used at training time (docs/data.md, "Bad samples at training
    time"); the keys of both ``data`` sections (pretraining and fine-tuning). Evaluation data is
    never skipped: every image must load."""

    # skip: a bad sample (missing, unreadable, truncated or over max_image_pixels) is replaced by
    # another one drawn with the item's seed and counted (metrics.jsonl "bad_samples"); raise: the
    # first one stops the run, naming the entry, the file and the reason.
    on_bad_sample: str = "skip"  # skip | raise
    # skip only: a run stops (or is refused up front, for missing image files) when more than this
    # share of its samples is bad.
    max_bad_fraction: float = 0.05
    # Images whose decoded bytes exceed an 8-bit RGB image of this many pixels are bad samples
    # (decompression-bomb guard, Pillow's pixel limit; 16-bit / RGBA count 2 / 4 bytes a pixel); 0: no limit.
    max_image_pixels: int = 89_478_485
    # Images whose shorter side is below this are upscaled to it (bicubic, aspect kept) before the transforms.
    min_image_side: int = 16

    def check_bad_sample_keys(self) -> None:
        """Validate the keys above (called by the subclasses' ``__post_init__``)."""
        check_choice("data.on_bad_sample", self.on_bad_sample, ["skip", "raise"])
        if not 0.0 <= self.max_bad_fraction <= 1.0:
            raise ConfigError(f"config key 'data.max_bad_fraction': got {self.max_bad_fraction}, expected 0 <= x <= 1")
        if self.max_image_pixels < 0:
            raise ConfigError(
                f"config key 'data.max_image_pixels': got {self.max_image_pixels}, expected >= 0 (0: no limit)"
            )
        if self.min_image_side < 1:
            raise ConfigError(f"config key 'data.min_image_side': got {self.min_image_side}, expected >= 1")


@dataclass
class DataConfig(BadSampleConfig):
    # Annotation files (ALBEF pretraining format, or Karpathy retrieval-train format).
    train: list[str] = field(default_factory=list)
    # Directory that relative image paths are resolved against; None: each file's directory.
    image_root: Optional[str] = None
    batch_size: int = 64
    num_workers: int = 0
    image: ImageConfig = field(default_factory=ImageConfig)
    # Optional zero-shot retrieval evaluation after training (Karpathy val/test format).
    eval: Optional[str] = None
    relevance: Optional[str] = None
    graded_relevance: Optional[str] = None  # captions x images .npy for nDCG (docs/data.md)
    # Captions drawn per image and step. 1: caption-level batches. k > 1: image-level batches of
    # B images x k captions (the ECIR SmoothAP protocol; model.arch=dual only).
    captions_per_image: int = 1
    # Text padding: to each batch's longest caption, or every batch to model.text.max_len (needed
    # across processes by loss.itm_negatives=global / loss.mlm_masking=global: a gather of text
    # needs the same shape on every rank). The losses are the same either way.
    text_padding: str = "longest"
    # json: data.train holds annotation files (map-style dataset). webdataset: data.train holds
    # shard folders written by `vlp make-shards` (streamed; docs/data.md, "Streaming shards").
    format: str = "json"  # json | webdataset
    # webdataset only: per-worker sample shuffle buffer, in items (held as undecoded bytes).
    shuffle_buffer: int = 1000
    # webdataset only: expand = one pair per caption (ALBEF's pair-level epoch); sample = one
    # random caption (or captions_per_image of them) per image and epoch.
    caption_mode: str = "expand"  # expand | sample
    # webdataset, img2dataset's shards: the key of {key}.json holding the caption (else vlp's
    # "captions" list, else {key}.txt).
    caption_key: str = "caption"
    # webdataset, URL shard sets only (s3://, gs://, http(s)://, pipe:): the samples of data.train,
    # as open_clip's --train-num-samples; no count is read at start-up, each shard's is estimated as
    # an equal share (docs/data.md, "Training from object storage"). None: counts from the shards'
    # _stats.json files or `vlp data index`.
    train_num_samples: Optional[int] = None
    # URL shard sets only: a read that gets no byte for this many seconds fails like a connection
    # reset (retried with backoff, then the shard is broken). Given to the backends as their own
    # timeouts (aiohttp's sock_read/sock_connect for http(s), botocore's read/connect_timeout for
    # s3); a pipe: command's output is waited for as long. 60 s, botocore's default: a slow link
    # still sends a byte a minute, a dead connection does not.
    url_read_timeout_s: float = 60.0
    # URL shard sets only: a shard whose bytes have not all arrived after this many seconds of
    # waiting for them (a trickling server) is broken at once, its remaining samples bad. Only the
    # time the reader waits for bytes counts (not decoding, not waiting for the training), so
    # 3600 s breaks a 1 GB LAION shard only below 0.3 MB/s (2.2 Mbit/s).
    url_shard_timeout_s: float = 3600.0

    def __post_init__(self) -> None:
        self.check_bad_sample_keys()
        for entry in self.train:  # before anything is written (config.yaml, run_info.json)
            refused = refusal(str(entry), "config key 'data.train': entry")
            if refused:
                raise ConfigError(refused)
        if self.image.decode == "device" and not self.image.uint8:
            raise ConfigError(
                "config key 'data.image.decode': device decodes and augments the images on the training "
                "device as uint8, normalised there: set data.image.uint8=true with it"
            )
        if self.captions_per_image < 1:
            raise ConfigError(f"config key 'data.captions_per_image': got {self.captions_per_image}, expected >= 1")
        check_choice("data.text_padding", self.text_padding, ["longest", "max_len"])
        check_choice("data.format", self.format, ["json", "webdataset"])
        check_choice("data.caption_mode", self.caption_mode, ["expand", "sample"])
        if self.train_num_samples is not None and self.train_num_samples < 1:
            raise ConfigError(f"config key 'data.train_num_samples': got {self.train_num_samples}, expected >= 1")
        for key in ("url_read_timeout_s", "url_shard_timeout_s"):
            if not getattr(self, key) > 0:
                raise ConfigError(f"config key 'data.{key}': got {getattr(self, key)}, expected seconds > 0")
        if self.shuffle_buffer < 1:
            raise ConfigError(f"config key 'data.shuffle_buffer': got {self.shuffle_buffer}, expected >= 1")
        if self.format == "webdataset" and self.captions_per_image > 1 and self.caption_mode != "sample":
            raise ConfigError(
                f"config key 'data.caption_mode': data.captions_per_image={self.captions_per_image} "
                "needs image-level items; with data.format=webdataset set data.caption_mode=sample"
            )
