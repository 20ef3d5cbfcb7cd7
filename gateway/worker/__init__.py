"""The worker process: the loop that takes leased turns, the dispatch by entry kind, failure handling."""
