"""ONNX export of a trained policy: prefix and step graphs, int8, and parity with torch."""
