"""The on-disk format: batch, segment and topic-metadata codecs (docs/format.md).

Pure encoding and decoding over storage; no rule about what may be written
when lives here.
"""
