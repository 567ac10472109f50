"""``torch._six`` (removed in torch 2.0): the Python 2/3 names torch 1.x code imported from it."""
import collections.abc as container_abcs
import math

string_classes = (str, bytes)
int_classes = int
inf = math.inf
nan = math.nan
PY2 = False
PY3 = True
PY37 = True

__all__ = ["PY2", "PY3", "PY37", "container_abcs", "inf", "int_classes", "nan", "string_classes"]
