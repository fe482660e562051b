"""What a method is applied to: backbones and the task models built on them.

Owns loading a backbone by name, folder, GGUF file or bundled shape (``backbones``, ``shapes``, ``gguf``), the
three architecture families (``families``), what a method may assume about a backbone's structure
(``architecture``), quantised frozen weights (``quantization``), and the two task models every method starts
from: the classifier (``classifier``) and the backbone's own LM head (``language_model``).  Imports nothing
heavy at package level; never imports the run, the sweep or the methods.
"""
