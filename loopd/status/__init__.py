"""What ``loopd serve`` shows of itself at ``LOOPD_METRICS_ADDR``: the status page (``page``, the
data ``loopcommon.statuspage`` renders), ``/metrics`` and its server (``server``), and the usage
collector (``usage``). Above the instruments it reads (``loopd.observe``) and the runtime
(``loopd.sessions``)."""
