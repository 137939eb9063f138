#!/usr/bin/env python3
"""Write data/home-electronics/: a small text-only catalogue from another domain than fashion.

Its categories are nodes of Google's product taxonomy (furniture and electronics), written the
way a shop writes its own menu (``Furniture > Living Room > Sofas``), each with the Google node
it is (``categories.csv``: what an automatic mapping should find). Brands are real furniture and
electronics makers. The furniture products carry no ``brand`` field and their colour only in the
title (the graph must learn both from the titles); the electronics products carry ``brand`` and a
``color`` attribute. Deterministic: re-running writes the same files.

    python scripts/make_home_electronics.py
"""

from __future__ import annotations

import csv
import json
import random
from pathlib import Path

OUT = Path(__file__).resolve().parents[1] / "data" / "home-electronics"

# shop path -> (Google taxonomy id, nouns a title uses, adjectives)
FURNITURE = {
    ("Furniture", "Living Room", "Sofas"): (460, ["Sofa", "3-Seater Sofa", "Loveseat"], ["Modern", "Velvet", "Fabric"]),
    ("Furniture", "Living Room", "Coffee Tables"): (1395, ["Coffee Table"], ["Round", "Oak", "Glass Top"]),
    ("Furniture", "Living Room", "Bookcases"): (465, ["Bookcase", "5-Shelf Bookcase"], ["Tall", "Oak", "Modern"]),
    ("Furniture", "Bedroom", "Beds"): (505764, ["Bed Frame", "Platform Bed"], ["Queen", "King", "Upholstered"]),
    ("Furniture", "Bedroom", "Dressers"): (4195, ["Dresser", "6-Drawer Dresser"], ["Wide", "Oak", "Modern"]),
    ("Furniture", "Dining", "Dining Tables"): (4355, ["Dining Table", "Extendable Dining Table"], ["Round", "Oak", "Rustic"]),
    ("Furniture", "Office", "Desks"): (4191, ["Desk", "Standing Desk", "Writing Desk"], ["Adjustable", "Compact", "Oak"]),
    ("Furniture", "Office", "Office Chairs"): (2045, ["Office Chair", "Task Chair"], ["Ergonomic", "Mesh", "Adjustable"]),
}
ELECTRONICS = {
    ("Electronics", "Audio", "Headphones"): (543626, ["Headphones", "Over-Ear Headphones"], ["Wireless", "Noise Cancelling"]),
    ("Electronics", "Audio", "Speakers"): (249, ["Speaker", "Bookshelf Speakers"], ["Bluetooth", "Portable", "Wireless"]),
    ("Electronics", "Computers", "Laptops"): (328, ["Laptop", "Notebook"], ["14-inch", "Thin", "16-inch"]),
    ("Electronics", "Computers", "Keyboards"): (303, ["Keyboard", "Mechanical Keyboard"], ["Wireless", "Compact"]),
    ("Electronics", "Computers", "Computer Mice"): (304, ["Mouse", "Gaming Mouse"], ["Wireless", "Ergonomic"]),
    ("Electronics", "Phones", "Mobile Phones"): (267, ["Smartphone"], ["5G", "Unlocked"]),
    ("Electronics", "TV & Video", "Televisions"): (404, ["Smart TV", "OLED TV", "LED TV"], ["55-inch", "65-inch", "4K"]),
    ("Electronics", "Office", "Printers"): (500106, ["Printer", "All-in-One Printer"], ["Laser", "Wireless", "Inkjet"]),
}
FURNITURE_BRANDS = ["IKEA", "Ashley", "Herman Miller", "Steelcase", "Zinus", "Sauder"]
ELECTRONICS_BRANDS = ["Sony", "Samsung", "LG", "Logitech", "Dell", "HP", "Bose", "Lenovo", "JBL", "Brother"]
COLOURS = ["Black", "White", "Grey", "Blue", "Green", "Beige", "Brown"]
PER_CATEGORY = 6


def main() -> None:
    rng = random.Random(25)
    OUT.mkdir(parents=True, exist_ok=True)
    records = []
    n = 0
    for block, brands, branded in ((FURNITURE, FURNITURE_BRANDS, False), (ELECTRONICS, ELECTRONICS_BRANDS, True)):
        for path, (_tid, nouns, adjs) in block.items():
            for _ in range(PER_CATEGORY):
                n += 1
                brand, noun, adj, colour = rng.choice(brands), rng.choice(nouns), rng.choice(adjs), rng.choice(COLOURS)
                model = f"{rng.choice('ABCDEFGHKLMRSTVX')}{rng.randint(10, 990)}"
                rec: dict = {"id": f"he-{n:04d}", "category": list(path), "price": round(rng.uniform(19, 1999), 2)}
                if branded:  # brand and colour as fields; the title starts with the brand too
                    rec["title"] = f"{brand} {model} {adj} {noun}"
                    rec["brand"] = brand
                    rec["attributes"] = {"color": colour}
                else:  # only the title says them: "Herman Miller Aeron Grey Ergonomic Office Chair"
                    rec["title"] = f"{brand} {model} {colour} {adj} {noun}"
                records.append(rec)
    with open(OUT / "catalog.jsonl", "w", encoding="utf-8") as f:
        for r in records:
            f.write(json.dumps(r, ensure_ascii=False) + "\n")
    with open(OUT / "categories.csv", "w", encoding="utf-8", newline="") as f:
        w = csv.writer(f)
        w.writerow(["category_path", "taxonomy_id"])
        for path, (tid, _, _) in {**FURNITURE, **ELECTRONICS}.items():
            w.writerow([" > ".join(path), tid])
    print(f"{len(records)} products, {len(FURNITURE) + len(ELECTRONICS)} categories -> {OUT}")


if __name__ == "__main__":
    main()
