"""detectron2's ``DatasetCatalog`` (name -> function returning the dataset's dicts) and ``MetadataCatalog``
(name -> ``Metadata``), which forks fill at import time (ClipBERT registers its Visual Genome splits)."""
from typing import NoReturn
import types

__all__ = ["DatasetCatalog", "MetadataCatalog", "Metadata"]


class DatasetCatalog:
    _REGISTERED = {}

    @staticmethod
    def register(name, func):
        if not callable(func):
            raise TypeError(f"DatasetCatalog.register({name!r}, ...): the second argument must be a function")
        if name in DatasetCatalog._REGISTERED:
            raise AssertionError(f"Dataset '{name}' is already registered!")
        DatasetCatalog._REGISTERED[name] = func

    @staticmethod
    def get(name):
        try:
            func = DatasetCatalog._REGISTERED[name]
        except KeyError:
            raise KeyError(f"Dataset '{name}' is not registered! Available datasets are: "
                           f"{', '.join(DatasetCatalog._REGISTERED)}") from None
        return func()

    @staticmethod
    def list():
        return list(DatasetCatalog._REGISTERED)

    @staticmethod
    def clear():
        DatasetCatalog._REGISTERED.clear()


class Metadata(types.SimpleNamespace):
    """Attributes of a dataset; a key once set cannot be set to another value (as detectron2)."""

    name = "N/A"

    def __getattr__(self, key) -> NoReturn:
        raise AttributeError(f"Attribute '{key}' does not exist in the metadata of '{self.name}'. "
                             f"Available keys are {', '.join(self.__dict__)}.")

    def __setattr__(self, key, value):
        if key in self.__dict__ and self.__dict__[key] != value:
            raise AssertionError(f"Attribute '{key}' in the metadata of '{self.name}' cannot be set to a "
                                 f"different value!\n{self.__dict__[key]} != {value}")
        super().__setattr__(key, value)

    def as_dict(self):
        return dict(self.__dict__)

    def set(self, **kwargs):
        for k, v in kwargs.items():
            setattr(self, k, v)
        return self

    def get(self, key, default=None):
        return self.__dict__.get(key, default)


class MetadataCatalog:
    _NAME_TO_META = {}

    @staticmethod
    def get(name):
        if name not in MetadataCatalog._NAME_TO_META:
            MetadataCatalog._NAME_TO_META[name] = Metadata(name=name)
        return MetadataCatalog._NAME_TO_META[name]

    @staticmethod
    def list():
        return list(MetadataCatalog._NAME_TO_META)
