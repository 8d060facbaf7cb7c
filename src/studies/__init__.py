"""The studies (the studies layer): the §2 ladder study, the analysis suite, the beyond-the-paper studies
(prevalence shift, monitoring, noisy labels, rates, injection) and simulated panels."""
