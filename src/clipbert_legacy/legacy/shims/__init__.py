"""Stand-in modules served under the names of packages that cannot be imported here (detectron2,
torchvision)."""
