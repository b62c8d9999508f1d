"""What a run trains on: the image and text tasks, their data, their models and sampling from them."""
