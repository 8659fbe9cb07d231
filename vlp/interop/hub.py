"""vlp models on the Hugging Face Hub: ``VLPModel.from_pretrained("org/name")`` and
``VLPModel.push_to_hub("org/name")``, through ``huggingface_hub``.

A Hub repository holds a :meth:`~vlp.api.VLPModel.save_pretrained` folder and a model card
(``README.md``). Downloads go through ``huggingface_hub``'s cache, with its revisions and its
offline mode (``HF_HUB_OFFLINE=1``: the cached snapshot, no network).
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any, Optional

from vlp.errors import CheckpointError

#: ``org/name`` as the Hub spells repository ids (a local path of that form wins: it is checked first)
REPO_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[A-Za-z0-9][\w.-]*$")


#: the prefix that makes a name a Hub id whatever else it could be (as open_clip spells it)
HF_HUB = "hf-hub:"


def hub_id(name: str) -> Optional[str]:
    """The repository id of ``hf-hub:org/name`` (``org/name``); None for a name without the prefix.
    A prefixed name that is not of the form ``org/name`` raises :class:`CheckpointError`."""
    if not name.startswith(HF_HUB):
        return None
    repo = name[len(HF_HUB) :]
    if not is_repo_id(repo):
        raise CheckpointError(f"{name}: after {HF_HUB!r} a Hugging Face Hub id is org/name")
    return repo


def is_repo_id(name: str) -> bool:
    """Whether ``name`` has the form of a Hub model id (``org/name``)."""
    return bool(REPO_ID.match(name)) and ".." not in name


def download(repo_id: str, revision: Optional[str] = None, cache_dir: Optional[str | Path] = None) -> Path:
    """The local snapshot folder of ``repo_id`` at ``revision`` (default: its main branch),
    downloaded into ``huggingface_hub``'s cache or found there (offline mode: only found)."""
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import (
        HfHubHTTPError,
        LocalEntryNotFoundError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    at = f"{repo_id}" + (f" (revision {revision})" if revision else "")
    try:
        return Path(snapshot_download(repo_id, revision=revision, cache_dir=cache_dir))
    except RevisionNotFoundError:
        raise CheckpointError(f"{at}: the Hugging Face Hub has no such revision") from None
    except RepositoryNotFoundError:
        raise CheckpointError(
            f"{at}: no such model on the Hugging Face Hub (or it is private: log in with `hf auth login`)"
        ) from None
    except LocalEntryNotFoundError:
        raise CheckpointError(
            f"{at}: not in the Hugging Face cache, and the Hub cannot be reached (offline: HF_HUB_OFFLINE is "
            "set, or no network); download it once online, or point to a local folder"
        ) from None
    except (HfHubHTTPError, OSError) as e:
        raise CheckpointError(f"{at}: download from the Hugging Face Hub failed ({e})") from None


def model_card(config: dict[str, Any], metrics: Optional[dict[str, float]] = None, data: Optional[str] = None) -> str:
    """The ``README.md`` of a pushed model: Hub metadata, then what the model is (``config``: the
    folder's ``config.json``), what it was trained on (``data``) and how it scores (``metrics``)."""
    kind, arch = config.get("kind", "?"), config.get("architecture", "?")
    source = config.get("source") or {}
    lines = [
        "---",
        "library_name: vlp",
        "tags:",
        "- vision-language",
        "- vlp",
        f"- {kind}",
        "---",
        "",
        f"# {arch} ({kind})",
        "",
        f"A vlp `{kind}` model ({arch}), saved by vlp {config.get('vlp_version', '?')} with `save_pretrained`.",
        "",
        "```python",
        "from vlp import VLPModel",
        'model = VLPModel.from_pretrained("<this repository>")',
        "```",
        "",
        "## Data",
        "",
        *_data_lines(data if data is not None else source.get("data")),
        "",
        "## Metrics",
        "",
    ]
    if metrics:
        lines += ["| metric | value |", "|---|---:|"]
        lines += [f"| {k} | {v:.4g} |" if isinstance(v, float) else f"| {k} | {v} |" for k, v in metrics.items()]
    else:
        lines.append("not stated")
    lines += ["", "## Source", "", f"step {source.get('step', '?')} of `{source.get('checkpoint', '?')}`"]
    lines += ["", "## Config", "", "```json", json.dumps(config.get("model", {}), indent=2), "```", ""]
    return "\n".join(lines)


def _data_lines(data: Any) -> list[str]:
    """What the model was trained on: the given text, or the run's data files as a list."""
    if isinstance(data, list | tuple):
        return [f"- `{f}`" for f in data] or ["not stated"]
    return [str(data) if data else "not stated"]


def upload(
    folder: Path, repo_id: str, private: bool = False, token: Optional[str] = None, message: Optional[str] = None
) -> str:
    """Create ``repo_id`` if needed and upload ``folder`` into it as one commit; returns the
    commit's URL."""
    from huggingface_hub import HfApi

    api = HfApi(token=token)
    api.create_repo(repo_id, private=private, exist_ok=True, repo_type="model")
    info = api.upload_folder(
        repo_id=repo_id, folder_path=str(folder), repo_type="model", commit_message=message or "Upload vlp model"
    )
    return str(getattr(info, "commit_url", info))
