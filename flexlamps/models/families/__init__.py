"""One short module per architecture family: its forward over the shared blocks, its weights as
data and its checkpoint's tensor names."""
