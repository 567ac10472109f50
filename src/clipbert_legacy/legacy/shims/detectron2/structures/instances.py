"""detectron2's ``Instances``: per-image fields of equal length (boxes, classes, ...) with indexing."""
import itertools

import torch

__all__ = ["Instances"]


class Instances:
    def __init__(self, image_size, **kwargs):
        self._image_size = tuple(image_size)
        self._fields = {}
        for k, v in kwargs.items():
            self.set(k, v)

    @property
    def image_size(self):
        return self._image_size

    def __setattr__(self, name, value):
        if name.startswith("_"):
            super().__setattr__(name, value)
        else:
            self.set(name, value)

    def __getattr__(self, name):
        if name == "_fields" or name not in self._fields:
            raise AttributeError(f"Cannot find field '{name}' in the given Instances!")
        return self._fields[name]

    def set(self, name, value):
        n = len(value)
        if self._fields and len(self) != n:
            raise ValueError(f"Adding a field of length {n} to an Instances of length {len(self)}")
        self._fields[name] = value

    def has(self, name):
        return name in self._fields

    def remove(self, name):
        del self._fields[name]

    def get(self, name):
        return self._fields[name]

    def get_fields(self):
        return self._fields

    def to(self, *args, **kwargs):
        out = Instances(self._image_size)
        for k, v in self._fields.items():
            out.set(k, v.to(*args, **kwargs) if hasattr(v, "to") else v)
        return out

    def __getitem__(self, item):
        if isinstance(item, int):
            if item >= len(self) or item < -len(self):
                raise IndexError("Instances index out of range!")
            item = slice(item, None, len(self))
        out = Instances(self._image_size)
        for k, v in self._fields.items():
            out.set(k, v[item])
        return out

    def __len__(self):
        for v in self._fields.values():
            return len(v)
        raise NotImplementedError("Empty Instances does not support __len__!")

    def __iter__(self):
        raise NotImplementedError("`Instances` object is not iterable!")

    @staticmethod
    def cat(instance_lists):
        if len(instance_lists) == 1:
            return instance_lists[0]
        out = Instances(instance_lists[0].image_size)
        for k, v0 in instance_lists[0]._fields.items():
            values = [i.get(k) for i in instance_lists]
            if isinstance(v0, torch.Tensor):
                values = torch.cat(values, dim=0)
            elif isinstance(v0, list):
                values = list(itertools.chain(*values))
            elif hasattr(type(v0), "cat"):
                values = type(v0).cat(values)
            else:
                raise ValueError(f"Unsupported type {type(v0)} for concatenation")
            out.set(k, values)
        return out

    def __repr__(self):
        n = len(self) if self._fields else 0
        return (f"Instances(num_instances={n}, image_height={self._image_size[0]}, "
                f"image_width={self._image_size[1]}, fields=[{', '.join(self._fields)}])")
