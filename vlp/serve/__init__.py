"""``vlp serve INDEX``: a local search page over an index of ``vlp index`` (docs/search.md): a query
box, the top hits as a grid with their scores, a hit's per-word Grad-CAM map of the query (as
``vlp explain`` draws it), "more like this" by a hit's image.

    from vlp.serve import open_server
    server = open_server("runs/index", port=0)     # the index and model loaded once
    print(server.url)                              # http://127.0.0.1:PORT/
    server.serve_until_interrupted()               # Ctrl-C stops it

Modules: :mod:`~vlp.serve.app` (:class:`SearchApp`: the searches, the images, the heat maps,
without HTTP), :mod:`~vlp.serve.server` (:class:`SearchServer`, the routes of the JSON API and the
page's files in ``vlp/serve/static/``).
"""

from vlp.serve.app import ApiError, SearchApp
from vlp.serve.server import DEFAULT_HOST, DEFAULT_PORT, SearchServer, open_server, static_files

__all__ = ["DEFAULT_HOST", "DEFAULT_PORT", "ApiError", "SearchApp", "SearchServer", "open_server", "static_files"]
