"""Exporting a model for deployment: ``vlp export onnx`` (:mod:`vlp.export.onnx`: the image and
text towers as ONNX graphs, with ``export.json`` and the tokenizer) and :class:`OnnxEncoders`
(:mod:`vlp.export.onnx_runtime`: such a folder run by onnxruntime). Importing this package imports
neither torch nor onnxruntime; :mod:`vlp.export.onnx` imports torch."""

from vlp.export.onnx_runtime import OnnxEncoders

__all__ = ["OnnxEncoders"]
