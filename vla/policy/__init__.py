"""The policy front end: observation in, action out, over a torch, onnxruntime or remote backend."""
