"""Video/image decoding is not reproduced (see the package docstring)."""


def read_video(*a, **k):
    raise NotImplementedError("torchvision shim: read_video")


def decode_image(*a, **k):
    raise NotImplementedError("torchvision shim: decode_image")


class ImageReadMode:
    UNCHANGED = 0
    RGB = 3
