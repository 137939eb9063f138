"""Languages: what Vitrine needs to read a language other than the catalogue's own.

A language plugs in as a segmenter (words out of a run of characters), a dictionary (its words
onto the catalogue's vocabulary), a lexicon (its forms of categories, colours, materials, brands)
and, where one reads it, a text tower. Chinese is the one language besides English today.
Nothing here loads at import: the segmenter and the dictionary load on first use.
"""
