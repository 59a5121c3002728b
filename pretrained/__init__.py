"""Data package: shipped neural block proposals (safetensors + JSON sidecars) and ``index.json``.

Contains no code; :func:`neuralblock.load_pretrained` reads the files.
"""
