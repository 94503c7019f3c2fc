"""AWS's catalog rules (`INFO.catalog_rules`), read by the catalog build
(`cloudtrain.catalog.build`). Standard library only, no SDK.

SUPPLEMENT_CSV: rows the reference file lacks, copied verbatim from the same upstream commit: CPU
machines for `ps` nodes in zones that have GPU rows. Columns as in the build's source, `source`
last. AWS prices every row as a whole VM, so there is no `attach` or `build` rule.
"""

from __future__ import annotations

_SRC = "skypilot-catalog v8 catalogs/v8/aws/vms.csv@00148f2af3672e2229b4f7bf8157d5a3f36e3c35"
SUPPLEMENT_CSV = f"""\
aws,m5.xlarge,,,4.0,16.0,eu-west-1,euw1-az2,0.214,0.100500,{_SRC}
"""
