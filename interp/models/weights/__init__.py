"""Weight files and foreign layouts -> timm's keys: training checkpoints, Hugging Face `transformers` folders,
open_clip, torchvision, original DINOv2/DINOv3 position tables and RoPE periods, and fitting a built model to a file."""
