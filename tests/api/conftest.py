"""The inference API's fixtures, shared with tests/test_api.py: five images, a tiny pretraining
run, and its model before and after ``save_pretrained``."""

from tests.test_api import images, pretrained, run_dir  # noqa: F401 (fixtures)
