"""Files and configuration (the io layer): where files are, atomic files and hashes, conf/ options and
params.yaml, raw benchmark records and their builders (Appendix J), dataset specs and the build API, the hub
fetchers, the monitor's vote store."""
