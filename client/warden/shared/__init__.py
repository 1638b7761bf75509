"""What the SDK and the plane share: the error table, canonical JSON, schemas.

Both sides import these modules so that a code's defaults, an input digest and
a redaction are computed by one piece of code, whichever side computes them.
"""
