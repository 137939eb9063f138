// The page's own text in the catalogue's language (GET /v1/ui/config `language`: "zh" when the
// catalogue's titles are Chinese, else "en"). An element marked data-i18n="key" gets the key's
// text, data-i18n-placeholder its placeholder, data-i18n-title its title; t(key) gives a text to
// scripts. English is the page as written; a language missing a key falls back to English.

export const TEXT = {
  en: {
    search: "Search",
    placeholder: "Search words, or drop / paste a photo",
    placeholderText: "Search the catalogue",
    welcome: "Search the catalogue with words, a photo, or both",
    welcomeText: "Search the catalogue",
    intro: "Type what you are looking for, or drop a product photo anywhere on the search box (you can also " +
      "paste one, or use the camera button). Open a product to see similar items and what goes well with it; " +
      "tick Compare on 2 to 5 products to see them side by side.",
    introText: "Type what you are looking for: suggestions appear as you type. Open a product to see similar " +
      "items and what goes well with it; tick Compare on 2 to 5 products to see them side by side.",
    hintText: "Type what you are looking for. Press slash to jump here.",
    try: "Try: ",
    sortBy: "Sort by",
    relevance: "Relevance",
    priceAsc: "Price: low to high",
    priceDesc: "Price: high to low",
    newest: "Newest",
    more: "More results",
    recommended: "Recommended for you",
    back: "← Back to results",
    similar: "Similar",
    goesWith: "Goes well with",
    compare: "Compare",
    addCompare: "Add to compare",
    visual: "Search with this photo",
    cart: "Add to cart",
    onlyDiff: "Show only differences",
    relate: "How they relate",
    clear: "Clear",
    analytics: "Analytics",
    rules: "Rules",
  },
  zh: {
    search: "搜索",
    placeholder: "输入商品名称，或拖入 / 粘贴一张图片",
    placeholderText: "搜索商品",
    welcome: "用文字、图片或两者一起搜索商品",
    welcomeText: "搜索商品",
    intro: "输入你想找的商品，或把商品图片拖到搜索框上（也可以粘贴，或点相机按钮上传）。打开一个商品可以看到相似商品和搭配推荐；" +
      "勾选 2 到 5 个商品的“对比”即可并排比较。",
    introText: "输入你想找的商品：边输入边给出建议（支持拼音，如 “sb” 或 “shoubiao”）。打开一个商品可以看到相似商品和搭配推荐；" +
      "勾选 2 到 5 个商品的“对比”即可并排比较。",
    hintText: "输入你想找的商品。按斜杠键跳到这里。",
    try: "试试：",
    sortBy: "排序",
    relevance: "综合",
    priceAsc: "价格从低到高",
    priceDesc: "价格从高到低",
    newest: "最新",
    more: "更多结果",
    recommended: "为你推荐",
    back: "← 返回结果",
    similar: "相似商品",
    goesWith: "搭配推荐",
    compare: "对比",
    addCompare: "加入对比",
    visual: "用这张图片搜索",
    cart: "加入购物车",
    onlyDiff: "只看不同项",
    relate: "它们的关系",
    clear: "清空",
    analytics: "数据分析",
    rules: "运营规则",
  },
};

let current = "en";

export function language() {
  return current;
}

export function t(key) {
  return (TEXT[current] && TEXT[current][key]) || TEXT.en[key] || key;
}

// Set the page's language and put its text in it (a language the table lacks: English).
export function applyLanguage(lang, root = document) {
  current = TEXT[lang] ? lang : "en";
  document.documentElement.lang = current === "zh" ? "zh-CN" : "en";
  document.body.dataset.lang = current;
  if (current === "en") return; // the page as written
  for (const el of root.querySelectorAll("[data-i18n]")) el.textContent = t(el.dataset.i18n);
  for (const el of root.querySelectorAll("[data-i18n-placeholder]")) el.placeholder = t(el.dataset.i18nPlaceholder);
  for (const el of root.querySelectorAll("[data-i18n-title]")) el.title = t(el.dataset.i18nTitle);
}
