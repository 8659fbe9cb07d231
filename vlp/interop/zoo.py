"""A model zoo by name: the released ALBEF checkpoints as tags (``albef-14m``, ``albef-vqa``, ...;
the presets with weights of the one preset registry, :mod:`vlp.config.presets`), downloaded on first use into a cache, converted as ``vlp convert albef`` does
(:func:`vlp.interop.albef.read_albef_file`, then :func:`~vlp.interop.albef.save_converted`) and
reused after that.

    from vlp import VLPModel, list_pretrained
    list_pretrained()                            # [('albef-base', 'albef-14m'), ('albef-base', 'albef-4m'), ...]
    m = VLPModel.from_pretrained("albef-14m")    # download, convert, verify, load

Cache layout (``$VLP_CACHE``, else ``~/.cache/vlp``)::

    downloads/<file>.part             a download in progress (or stopped: the next fetch continues it
                                      from its size), then checked and converted under this name
    downloads/<file>                  a download that converted, renamed from ``.part`` only then; kept
                                      for re-conversion, checked and converted again before each reuse
    converted/<tag>/                  the vlp checkpoint folder (model.safetensors, state.json,
                                      manifest.json, key_report.json); reused while its manifest verifies
    converted/<tag>.partial-<pid>/    a conversion in progress, renamed to ``<tag>`` when complete
    locks/<tag>.lock, locks/<file>.lock   empty lock files (kept; see below)

The cache never keeps a bad file. A download is checked before it is renamed into place: its size and
SHA-256 where published (no ALBEF file has them), its Content-Length, and the file itself as a PyTorch
checkpoint container, without unpickling (:func:`vlp.interop.download.torch_file_problem`: a zip's
central directory and CRCs, or the legacy pickle header); then it is read (tensors and plain
containers only, each tensor's storage bounded: :func:`vlp.weights.read_state_dict`) and converted
in memory. A new download that fails any of these is removed and named in one error (its URL and
what was wrong); a file already under ``downloads/`` that fails (one an older vlp kept) is named on
stderr, removed and downloaded again. So the next fetch asks the server again. Writing the converted
folder comes last: a failure there (a full disk, an interrupt) keeps the download, which the next
fetch converts again without downloading.

A download that stops part-way is continued from the byte it reached, never started again: a dropped
connection within the fetch through the retrying reader URL shards use (a ranged request from the
size of ``<file>.part``, only a 206 starting there taken; :func:`vlp.interop.download.transfer`), and
a fetch that failed on the network or was stopped (an interrupt, a killed process) by the next
fetch, from the ``.part`` it kept. A server that ignores ``Range:`` sends the whole file again: its
first bytes are passed over, and the fetch says so once on stderr. Each socket read times out after
``$VLP_ZOO_TIMEOUT_S`` (60 s) and the whole download after ``$VLP_ZOO_DEADLINE_S`` (6 h) of waiting
(the defaults: ``TIMEOUT_S`` and ``DEADLINE_S`` of :mod:`vlp.interop.download`).

Messages go to this module's logger (``vlp.interop.zoo``): the conversion's report and every
warning at WARNING, which vlp's command line prints on stderr; that a fetch continues a ``.part`` at INFO.

Two fetches into one cache, from threads or processes, wait for each other: a fetch that does not
find a verified converted folder takes the tag's lock (then the file's) before it downloads or
converts, and looks for the folder again once it holds it; the one that waited reuses what the other
made. The waiting one says so on stderr (with ``progress``).

URL overrides (tests, mirrors, a local copy): ``VLP_ZOO_URL_<TAG>`` (the tag upper-cased with every
other character ``_``, e.g. ``VLP_ZOO_URL_ALBEF_14M``) replaces one tag's URL; ``VLP_ZOO_MIRROR``
(a base URL) serves every file under its official file name. ``file://`` URLs work as well.
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
import shlex
import shutil
from collections.abc import Iterator, MutableMapping
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from vlp.config import PRESETS, Preset, Weights, preset_model_config
from vlp.config.model import architecture_differences
from vlp.config.presets import ALBEF_RELEASE, albef_release, list_presets
from vlp.errors import CheckpointError, ConfigError, DataError, DownloadError
from vlp.interop.albef import ConvertedALBEF, KeyReport, read_albef_file, save_converted
from vlp.interop.download import CHUNK, TransferError, deadline_s, timeout_s, torch_file_problem, transfer
from vlp.interop.hub import download, hub_id, is_repo_id
from vlp.locks import file_lock
from vlp.models.build import model_image_size
from vlp.remote.url_credentials import redacted
from vlp.weights import MANIFEST, find_checkpoint

logger = logging.getLogger(__name__)

OFFICIAL = ALBEF_RELEASE
#: what a converted folder must hold to be reused (model.safetensors is checked by the manifest)
REQUIRED = (MANIFEST, "state.json", "key_report.json")
MIRROR_ENV, URL_ENV_PREFIX, CACHE_ENV = "VLP_ZOO_MIRROR", "VLP_ZOO_URL_", "VLP_CACHE"
#: what a file that does not read or convert raises (:func:`read_albef_file`: no user option is
#: involved, so each is the file's fault): the file is removed from the cache
FILE_ERRORS = (CheckpointError, DataError, ConfigError)


@dataclass(frozen=True)
class Pretrained:
    """One released checkpoint, as the zoo reads a preset with weights (:mod:`vlp.config.presets`).
    ``tag``: the name users type; ``url``: the official download; ``kind``: the ALBEF layout handed
    to :func:`read_albef_file` (one of its ``KINDS``); ``image_size``: the resolution it was
    trained at (px; the converted model keeps it); ``about``: what it is; ``sha256`` / ``size``: of
    the file (bytes), ``None`` where not published."""

    tag: str
    url: str
    kind: str
    image_size: int
    about: str
    sha256: Optional[str] = None
    size: Optional[int] = None

    def __post_init__(self) -> None:
        try:
            _ = self.weights
        except ConfigError as e:
            raise ConfigError(f"pretrained {self.tag}: {e}") from None

    @property
    def weights(self) -> Weights:
        """The registry's record of the file (checks the kind and the SHA-256's form)."""
        return Weights(self.url, self.kind, self.sha256, self.size)

    @property
    def filename(self) -> str:
        """The file name of the official URL (also the name under a mirror and in the cache)."""
        return self.weights.filename

    @classmethod
    def of(cls, preset: Preset) -> Pretrained:
        """The entry of a preset with released weights (its image size: its architecture's)."""
        w = preset.weights
        if w is None:
            raise CheckpointError(f"preset {preset.name!r} has no released weights (a model preset: vlp.list_models())")
        size = model_image_size(preset_model_config(preset))
        return cls(preset.name, w.url, w.kind, size, preset.about, w.sha256, w.size)

    def preset(self) -> Preset:
        """This entry as a registry preset: an official ALBEF checkpoint (:func:`albef_release`)."""
        return albef_release(self.tag, self.url, self.kind, self.image_size, self.about, self.sha256, self.size)


class Released(MutableMapping[str, Pretrained]):
    """The registry's presets with released weights as zoo entries, by tag in registration order:
    a live view, so a preset registered later (``PRESETS.register``, :data:`vlp.config.PRESETS`) is listed and
    fetched too. Setting an entry registers its preset (replacing one of that name:
    :meth:`Pretrained.preset`), deleting one unregisters it."""

    def __getitem__(self, tag: str) -> Pretrained:
        if tag not in PRESETS or PRESETS.get(tag).weights is None:
            raise KeyError(tag)
        return Pretrained.of(PRESETS.get(tag))

    def __iter__(self) -> Iterator[str]:
        return iter([p.name for p in list_presets(released=True)])

    def __len__(self) -> int:
        return len(list_presets(released=True))

    def __setitem__(self, tag: str, entry: Pretrained) -> None:
        if tag != entry.tag:
            raise ConfigError(f"pretrained entry {entry.tag!r} set under another tag, {tag!r}")
        PRESETS.register(tag, entry.preset(), replace=True)

    def __delitem__(self, tag: str) -> None:
        if tag not in self:  # a model preset is not the zoo's to remove
            raise KeyError(tag)
        PRESETS.unregister(tag)


#: tag -> entry: the presets with released weights (the ALBEF release: :mod:`vlp.config.presets`)
PRETRAINED: MutableMapping[str, Pretrained] = Released()


def list_pretrained() -> list[tuple[str, str]]:
    """``(architecture, tag)`` of each trained model, as open_clip's ``list_pretrained`` pairs them:
    ``vlp.create_model_and_transforms(architecture, pretrained=tag)`` loads it (as does
    ``VLPModel.from_pretrained(tag)``; :func:`fetch`). The tags alone: :func:`pretrained_tags`."""
    return [(pretrained_architecture(tag), tag) for tag in PRETRAINED]


def pretrained_tags() -> list[str]:
    """The tags :meth:`vlp.VLPModel.from_pretrained` and :func:`fetch` accept, in registration order."""
    return list(PRETRAINED)


def pretrained_architecture(tag: str) -> str:
    """The model preset (:func:`vlp.list_models`) whose architecture zoo tag ``tag`` has: the first
    registered one with its ``arch`` and tower presets (its resolution may differ: ``albef-vqa`` is
    ``albef-base`` at 384 px); the tag itself when none has (``create_model_and_transforms(tag)``
    loads it as well)."""
    cfg = preset_model_config(pretrained_entry(tag).tag)
    for preset in list_presets(released=False):
        if not architecture_differences(preset_model_config(preset), cfg):
            return preset.name
    return tag


def pretrained_entry(tag: str) -> Pretrained:
    """The table entry of ``tag``; :class:`CheckpointError` listing the known tags otherwise."""
    if tag not in PRETRAINED:
        raise CheckpointError(f"unknown pretrained model {tag!r}; known: {', '.join(PRETRAINED)}")
    return PRETRAINED[tag]


def cache_dir() -> Path:
    """``$VLP_CACHE``, else ``~/.cache/vlp``."""
    return Path(os.environ.get(CACHE_ENV) or Path.home() / ".cache" / "vlp").expanduser()


def url_env(tag: str) -> str:
    """The environment variable that overrides ``tag``'s URL: ``albef-14m`` -> ``VLP_ZOO_URL_ALBEF_14M``."""
    return URL_ENV_PREFIX + re.sub(r"[^A-Z0-9]", "_", tag.upper())


def source_url(entry: Pretrained) -> str:
    """Where ``entry`` is downloaded from: ``VLP_ZOO_URL_<TAG>``, else ``$VLP_ZOO_MIRROR/<file>``,
    else the official URL."""
    if url := os.environ.get(url_env(entry.tag)):
        return url
    if mirror := os.environ.get(MIRROR_ENV):
        return f"{mirror.rstrip('/')}/{entry.filename}"
    return entry.url


def format_pretrained() -> str:
    """The table ``vlp zoo list`` prints: each tag with its kind, image size and download URL, and
    what it is below."""
    return "\n".join(
        f"{e.tag:24s} {e.kind:10s} {e.image_size:4d} px  {redacted(source_url(e))}\n{'':24s} {e.about}"
        for e in PRETRAINED.values()
    )


def resolve_pretrained(
    name_or_path: str | os.PathLike, cache: Optional[Path] = None, progress: bool = True, revision: Optional[str] = None
) -> Path:
    """``hf-hub:org/name``: always that Hugging Face Hub id (at ``revision``:
    :func:`vlp.interop.hub.download`). Else an existing path as is; else a zoo tag, fetched
    (:func:`fetch`); else a bare Hub id ``org/name``; else :class:`CheckpointError` listing the known
    tags. The rule for the ambiguous case: a local folder named like a tag or an id is that folder
    (``hf-hub:`` reaches the Hub past it)."""
    name = os.fspath(name_or_path)
    repo = hub_id(name)
    if repo is not None:
        return download(repo, revision)
    path = Path(name_or_path)
    if path.exists():
        return path
    if name in PRETRAINED:
        return fetch(name, cache, progress)
    if is_repo_id(name):
        return download(name, revision)
    raise CheckpointError(
        f"{name}: no such file or folder, not a pretrained model name (known: {', '.join(PRETRAINED)}), "
        "not a Hugging Face Hub id (org/name) and not a model preset (vlp.list_models())"
    )


def fetch(tag: str, cache: Optional[Path] = None, progress: bool = True) -> Path:
    """The converted vlp checkpoint folder of ``tag``: ``<cache>/converted/<tag>`` reused when its
    manifest verifies; else the official file downloaded (or one already downloaded reused), checked,
    read and converted (a file that fails is removed), then written into a staging folder and renamed
    into place. A fetch that downloads or converts
    holds the tag's and the file's locks (``<cache>/locks/``): a second fetch into the same cache
    waits, then reuses the folder the first one made. ``progress``: the byte progress bar, the
    conversion's key report and any wait on stderr. Raises :class:`DownloadError` (network, time
    limit, size, SHA-256, not a complete PyTorch checkpoint), :class:`ConfigError` (a malformed
    ``VLP_ZOO_TIMEOUT_S`` / ``VLP_ZOO_DEADLINE_S``), :class:`CheckpointError` (unknown tag, a
    download that does not read or convert, writing the converted folder)."""
    entry = pretrained_entry(tag)
    url = source_url(entry)
    timeout_s(), deadline_s()  # malformed values fail before any wait or request
    root = Path(cache) if cache is not None else cache_dir()
    out = root / "converted" / tag
    if _usable(out, warn=False):  # no lock needed to read a verified folder
        return out
    tag_lock, download_lock = root / "locks" / f"{tag}.lock", root / "locks" / f"{entry.filename}.lock"

    def waiting(lock: Path) -> Optional[str]:
        return f"{tag}: waiting for another fetch into {root} (lock {lock})" if progress else None

    with file_lock(tag_lock, waiting(tag_lock)), file_lock(download_lock, waiting(download_lock)):
        if _usable(out, progress):  # made by the fetch this one waited for
            return out
        converted = _obtain(entry, url, root / "downloads" / entry.filename, out, progress)
        report = _save(converted, out)
    if progress:
        logger.warning(f"{tag}: {report.summary()}\nconverted into {out}")
    return find_checkpoint(out, REQUIRED)


# ----------------------------------------------------------------------------- internals


def _usable(folder: Path, warn: bool) -> bool:
    """Whether ``folder`` is a complete converted checkpoint (manifest and key report verify)."""
    if not folder.is_dir():
        return False
    try:
        find_checkpoint(folder, REQUIRED)
    except CheckpointError as e:
        if warn:
            logger.warning(f"warning: {e}; converting again")
        return False
    return True


def manual_steps(entry: Pretrained, url: str, dest: Path, out: Path) -> str:
    """The commands that do by hand what :func:`fetch` does."""
    d, o = shlex.quote(str(dest)), shlex.quote(str(out))
    return (
        f"download it yourself (e.g. curl -L --create-dirs -o {d} {url}), then run `vlp convert albef {d} {o} --kind "
        f"{entry.kind}` and load it with VLPModel.from_pretrained({str(out)!r}) (from_pretrained"
        f"({entry.tag!r}) reuses that folder)"
    )


def _one_line(e: BaseException) -> str:
    """An error's message on one line (a strict load's lists its missing and unexpected keys on several)."""
    return "; ".join(line.strip() for line in str(e).splitlines() if line.strip())


def _obtain(entry: Pretrained, url: str, dest: Path, out: Path, progress: bool) -> ConvertedALBEF:
    """``entry``'s file read and converted in memory. ``dest``, an earlier download, if it passes
    :func:`_problem` and converts; else it is removed (said on stderr) and the file is fetched from
    ``url`` into ``dest.part`` (:func:`_download`), read and converted there, and renamed to ``dest``
    only then. A download that does not convert is removed and named in one
    :class:`CheckpointError`; on any other failure (an interrupt) it is kept as ``dest.part``, which
    the next fetch continues (a complete one: a request past its end, answered 416) and checks
    again. The caller holds the file's lock."""
    if dest.is_file():
        problem = _problem(entry, dest)
        if problem is None:
            try:
                return read_albef_file(dest, kind=entry.kind)
            except FILE_ERRORS as e:
                problem = f"does not convert ({_one_line(e)})"
        logger.warning(redacted(f"warning: {dest}: {problem}; removed, downloading again from {url}"))
        dest.unlink()
    part = _download(entry, url, dest, out, progress)
    try:
        converted = read_albef_file(part, kind=entry.kind)
    except FILE_ERRORS as e:
        _discard(part)
        raise CheckpointError(
            f"{entry.tag}: the file downloaded from {url} does not convert and was removed from "
            f"{dest.parent}: {_one_line(e)}"
        ) from None
    os.replace(part, dest)
    converted.meta["converted_from"] = str(dest)
    return converted


def _download(entry: Pretrained, url: str, dest: Path, out: Path, progress: bool) -> Path:
    """``dest.part``: ``entry``'s file fetched from ``url`` and checked (:func:`_problem`), for
    :func:`_obtain` to read. A ``dest.part`` an earlier fetch left (stopped, or its connection lost
    past the reader's tries) is continued from its size (:func:`vlp.interop.download.transfer`).
    :class:`DownloadError` on failure: a network failure or the deadline keeps the bytes received
    in ``dest.part`` for the next fetch to continue (none received: nothing kept); a refused file,
    or one the server's answers no longer fit, is removed. Any other failure (an interrupt, a full
    disk) keeps ``dest.part`` as well."""
    part = dest.with_name(dest.name + ".part")
    dest.parent.mkdir(parents=True, exist_ok=True)
    start = part.stat().st_size if part.is_file() else 0
    if start and progress:
        logger.info(f"{entry.tag}: continuing the download in {part} from byte {start:,}")
    named: list[int] = []

    def on_whole(n: int) -> None:  # named once per fetch, whatever the tries
        if not named:
            logger.warning(
                redacted(f"warning: {url} ignores Range requests: {entry.tag} is read from byte 0 again ")
                + f"(its first {n:,} bytes, already in {part}, are passed over)"
            )
        named.append(n)

    try:
        got, length = transfer(url, part, entry.size, f"download {entry.tag}", progress, on_whole)
    except TransferError as e:
        kept = e.continuable and _kept(part)
        if not kept:
            _discard(part)
        keeping = (
            f"the {part.stat().st_size:,} bytes received are kept in {part} for the next fetch to continue; "
            if kept
            else ""
        )
        raise DownloadError(
            f"cannot download {entry.tag} from {url} ({e}) into {dest}; {keeping}{manual_steps(entry, url, dest, out)}"
        ) from e
    except BaseException:  # an interrupt, a full disk: what arrived is kept for the next fetch
        if not _kept(part):
            _discard(part)
        raise
    problem = f"connection closed after {got} of {length} bytes" if length is not None and got != length else None
    problem = problem or _problem(entry, part)
    if problem is not None:
        _discard(part)
        raise DownloadError(
            f"{entry.tag}: the file downloaded from {url} into {dest} was refused and removed: {problem}; "
            f"{manual_steps(entry, url, dest, out)}"
        )
    return part


def _kept(part: Path) -> bool:
    """Whether ``part`` holds bytes (a download to continue)."""
    return part.is_file() and part.stat().st_size > 0


def _discard(part: Path) -> None:
    """Remove ``part`` and its folder if that is left empty (made for this download alone)."""
    part.unlink(missing_ok=True)
    _remove_if_empty(part.parent)


def _remove_if_empty(folder: Path) -> None:
    """Remove ``folder`` if a failed download left it empty (made for that download alone)."""
    try:
        folder.rmdir()
    except OSError:  # not empty (other downloads), or already gone
        pass


def _problem(entry: Pretrained, path: Path) -> Optional[str]:
    """What is wrong with a downloaded file (None: fine): its size against ``entry``'s, then its
    SHA-256 against ``entry``'s; without a published SHA-256, whether it is a complete PyTorch
    checkpoint container (:func:`vlp.interop.download.torch_file_problem`; never unpickled)."""
    if entry.size is not None and path.stat().st_size != entry.size:
        return f"{path.stat().st_size} bytes, expected {entry.size}"
    if entry.sha256 is None:
        return torch_file_problem(path)
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(CHUNK), b""):
            digest.update(chunk)
    if digest.hexdigest() != entry.sha256:
        return f"SHA-256 {digest.hexdigest()}, expected {entry.sha256}"
    return None


def _remove(folder: Path) -> None:
    """A staging folder and the ``.tmp`` folder :func:`save_checkpoint` stages it in."""
    for p in (folder, folder.with_name(folder.name + ".tmp")):
        shutil.rmtree(p, ignore_errors=True)


def _save(converted: ConvertedALBEF, out: Path) -> KeyReport:
    """``converted`` written into ``out.partial-<pid>`` and renamed to ``out`` once complete (the
    key report written): a failed or interrupted write never leaves a folder named ``out``."""
    staging = out.with_name(f"{out.name}.partial-{os.getpid()}")
    _remove(staging)
    try:
        report = save_converted(converted, staging)
        _remove(out)  # a folder that did not verify
        try:
            os.replace(staging, out)
        except OSError:  # another process put a complete one there meanwhile
            if not _usable(out, warn=False):
                raise
    finally:
        _remove(staging)
    return report
