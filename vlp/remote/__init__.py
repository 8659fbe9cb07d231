"""Reading from URLs, below the data layer: shards by URL (``s3://``, ``gs://``, ``http(s)://``,
``pipe:``) opened as checked, bounded, retried streams, and the credentials a URL may hold found,
refused and redacted. It imports nothing of vlp but :mod:`vlp.errors`; :mod:`vlp.data` reads its
URL shards through it, and the config, the logs and the command line redact with it.

- :mod:`vlp.remote.shard_urls`: a URL entry's tars (:func:`~vlp.remote.shard_urls.shard_urls`), a
  shard opened as a retried stream (:func:`~vlp.remote.shard_urls.open_url`), a small body read whole
  (:func:`~vlp.remote.shard_urls.read_small`), a shard's reachability;
- :mod:`vlp.remote.url_deadlines`: the per-read and per-shard deadlines (``UrlTimeouts``), the
  filesystems' own retries turned off, a ``pipe:`` command's output read under a deadline;
- :mod:`vlp.remote.url_bodies`: bodies read checked and bounded (ranged reads, byte budgets);
- :mod:`vlp.remote.brace_patterns`: brace patterns counted before they are expanded (a cap);
- :mod:`vlp.remote.pipe_guard`: the guard script of a ``pipe:`` command (its own process group);
- :mod:`vlp.remote.url_credentials`: credentials in URLs found, refused and redacted (``***``).

This package's ``__init__`` imports none of them: importing :mod:`vlp.remote.url_credentials` costs
no fsspec.
"""
