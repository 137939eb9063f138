"""The phrase tables the intent query generator (vitrine/training/intent_queries.py) fills its
templates with: other domains' products, gender and price forms, currencies, fillers, modifiers."""

from __future__ import annotations

OTHER_PRODUCTS = {
    "en": ["headphones", "airpods pro 2", "iphone 15", "a laptop", "bluetooth speaker", "smartwatch", "gaming mouse",
           "coffee maker", "yoga mat", "power bank", "kindle", "air fryer", "earbuds", "phone case", "desk lamp"],
    "zh": ["耳机", "蓝牙音箱", "手机", "笔记本电脑", "充电宝", "AirPods Pro 2", "iPhone 15", "咖啡机", "瑜伽垫",
           "空气炸锅", "降噪耳机", "手机壳", "台灯", "电动牙刷", "这个耳机"],
}
GENDER_FORMS = {
    "en_adj": {"Men": ["men's", "mens", "men", "male", "gents"], "Women": ["women's", "womens", "women", "ladies", "female"],
               "Boys": ["boys", "boys'"], "Girls": ["girls", "girls'"], "Unisex": ["unisex"]},
    "en_for": {"Men": ["for men", "for him", "for guys"], "Women": ["for women", "for her", "for ladies"],
               "Boys": ["for boys", "for my son"], "Girls": ["for girls", "for my daughter"], "Unisex": ["unisex"]},
    "zh": {"Men": ["男士", "男款", "男生", "男"], "Women": ["女士", "女款", "女生", "女"], "Boys": ["男童", "男孩"],
           "Girls": ["女童", "女孩"], "Unisex": ["中性", "男女同款"]},
    "en_g": {"Men": ["for my dad", "for my husband", "for my boyfriend", "for him"],
             "Women": ["for my mom", "for my wife", "for my girlfriend", "for her"],
             "Boys": ["for my son"], "Girls": ["for my daughter"]},
    "zh_g": {"Men": ["给男朋友", "给老公", "送爸爸"], "Women": ["给女朋友", "给老婆", "送妈妈"], "Boys": ["给儿子"],
             "Girls": ["给女儿"]},
}
PRICE_FORMS = {
    # (form, kind); {n}/{a}/{b} numbers, {c} currency prefix, {s} currency suffix
    "train": {
        "en": [("under {c}{n}", "max"), ("below {c}{n}", "max"), ("less than {c}{n}{s}", "max"), ("within {n}{s}", "max"),
               ("upto {c}{n}", "max"), ("under {n}{s}", "max"), ("{c}{n} and below", "max"), ("max {c}{n}", "max"),
               ("{n}{s} or less", "max"), ("budget {c}{n}", "max"), ("above {c}{n}", "min"), ("over {c}{n}", "min"),
               ("more than {n}{s}", "min"), ("at least {c}{n}", "min"), ("{c}{n} and above", "min"),
               ("starting from {c}{n}", "min"), ("between {c}{a} and {c}{b}", "range"), ("{c}{a}-{b}{s}", "range"),
               ("from {c}{a} to {c}{b}", "range"), ("price {a} to {b}", "range")],
        "zh": [("{n}元以下", "max"), ("{n}以内", "max"), ("{n}块以内", "max"), ("低于{n}", "max"), ("不超过{n}元", "max"),
               ("{n}元以上", "min"), ("高于{n}", "min"), ("{a}到{b}元", "range"), ("{a}-{b}元", "range"),
               ("在{a}和{b}之间", "range"), ("预算{n}", "max"), ("under {n}", "max")],
    },
    "test": {
        "en": [("not more than {c}{n}", "max"), ("up to {c}{n}", "max"), ("cheaper than {n}{s}", "max"), ("at most {c}{n}", "max"),
               ("{n}{s} max", "max"), ("{c}{n}+", "min"), ("minimum {c}{n}", "min"), ("{c}{n} or more", "min"),
               ("priced {a} to {b}{s}", "range"), ("{c}{a} to {c}{b}", "range")],
        "zh": [("{n}块钱以下", "max"), ("不到{n}元", "max"), ("最多{n}", "max"), ("超过{n}元", "min"), ("{n}块以上", "min"),
               ("{a}至{b}元", "range"), ("{a}~{b}元", "range")],
    },
}
PRICES = [199, 249, 299, 399, 499, 500, 599, 699, 799, 899, 999, 1000, 1200, 1299, 1499, 1500, 1799, 1999, 2000,
          2499, 2500, 2999, 3000, 3499, 3999, 4000, 4999, 5000, 6000, 7999, 8000, 10000, 15000]
CUR_PRE = ["", "", "", "₹", "rs ", "rs.", "Rs. ", "inr ", "$"]
CUR_POST = ["", "", "", " rupees", " rs", " bucks", "/-"]
FILLERS = {
    "en_pre": ["hey ", "hi, ", "pls ", "please ", "umm ", "ok so ", "yo ", "hello, ", "quick question: ", "so "],
    "en_post": [" thanks", " pls", " asap", " 😊", " 🙏", " 👍", "!!", " ?", "...", " thx"],
    "zh_pre": ["你好，", "请问", "亲，", "嗯 ", "那个", "麻烦"],
    "zh_post": ["谢谢", "呢", "呀", "？", "！", " 😊", " 🙏", "哈"],
}
# Neutral words around a product phrase, in every intent: they must not sway the label.
MODIFIERS = {
    "en_pre": ["stylish", "comfortable", "cotton", "leather", "slim fit", "printed", "classic", "trendy", "waterproof",
               "lightweight", "premium", "branded", "cool", "cute", "elegant", "plain", "striped", "solid"],
    "en_post": ["for office", "for parties", "for summer", "for winter", "with pockets", "in size 9", "in medium",
                "for daily wear", "for travel", "for college"],
    "zh_pre": ["百搭", "纯棉", "真皮", "修身", "舒适的", "潮流", "夏季", "冬季", "经典款", "轻便", "大码"],
    "zh_post": ["夏天穿", "上班穿", "(大码)"],
}
