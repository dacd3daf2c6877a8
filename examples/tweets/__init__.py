"""Exactly-once hashtag, mention and pair counts over a stream of tweets.

Run ``python -m examples.tweets --help``. The pieces are usable on their own:
``sources`` (six spouts), ``bolts`` (parse and count), ``topology`` (the wiring),
``generate`` and ``load`` (test data).
"""
