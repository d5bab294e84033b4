"""``release card``: bilingual model cards from Jinja templates, Babel catalogs and the data of each build.

Every number comes from a file another stage wrote: ``provenance.json`` (build), ``verification/report.json``
(verify), ``<dist>/tables/tables.json`` (tables) and, when present, ``<dist>/selection.json`` (select). Strings are
translated through ``locales/<lang>/LC_MESSAGES/messages.po`` (compiled in memory), numbers and dates are formatted
by Babel for the card's locale.

The modules, in the order they build on each other: ``particles`` (Korean particles), ``i18n`` (catalogs,
formatting), ``labels`` (the fixed words), ``rows`` (the measured tables' rows), ``conclusions`` (the sentences
under them), ``sections`` (setup, decision, reproduction, the tables with their notes), ``plot`` (the forest plot),
``context`` (the data to a template context) and ``render`` (the request and the files written).
"""
