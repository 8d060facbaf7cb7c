"""What a reader sees (the present layer): the figures, the Markdown report, the main job's summary lines,
the DVC metrics and β files."""
