"""Structured after-sales answers: what an after-sales query is about, and the steps to take.

An after-sales query ("how do I return these sandals", "退款什么时候到账") gets no product
ranking but an answer: its topic (returns, refund, exchange, delivery, cancellation, damaged,
payment, or general help), a short text and the steps, in the query's language (Chinese when the
query has Chinese characters). The wording is generic store guidance; a shop replaces it with its
own policy by passing ``answers`` (same shape as :data:`ANSWERS`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

_CJK = re.compile(r"[\u4e00-\u9fff]")

# topic -> cue words (checked in this order: the first topic with a cue wins)
TOPICS: list[tuple[str, list[str]]] = [
    ("cancellation", ["cancel", "取消"]),
    ("refund", ["refund", "money back", "reimburse", "退款", "退钱", "钱什么时候", "退回来"]),
    ("damaged", ["damaged", "defect", "defective", "broke", "broken", "torn", "faulty", "warranty", "repair",
                 "not working", "坏", "破损", "质量", "保修", "维修"]),
    ("exchange", ["exchange", "swap", "replace", "replacement", "bigger size", "smaller size", "another size",
                  "wrong size", "doesn't fit", "does not fit", "换货", "换一", "换个", "尺码", "换吗"]),
    ("returns", ["return", "send back", "send it back", "sending back", "退货", "想退", "退回", "退掉"]),
    ("delivery", ["where is my order", "where's my order", "track", "deliver", "arrive", "parcel", "package",
                  "shipping", "shipped", "transit", "late", "status of my order", "order status", "missing",
                  "物流", "快递", "发货", "到哪", "配送", "没到", "丢了"]),
    ("payment", ["charged", "payment", "deducted", "debited", "invoice", "bill", "扣款", "扣钱", "支付", "付款", "发票"]),
    ("wrong_item", ["wrong item", "wrong product", "different item", "发错", "错了"]),
]

ANSWERS: dict[str, dict[str, dict[str, Any]]] = {
    "returns": {
        "en": {"text": "You can return an unused item with its tags within the return window shown on your order.",
               "steps": ["Open Orders and pick the item.", "Choose Return and give a reason.",
                         "Pack it with its tags and hand it to the courier at pickup.",
                         "The refund starts once the item passes a quality check."]},
        "zh": {"text": "未使用且吊牌完好的商品可在订单页显示的退货期内申请退货。",
               "steps": ["打开“我的订单”，选择该商品。", "点击“申请退货”并填写原因。", "带吊牌包装好，交给上门取件的快递员。",
                         "商品质检通过后开始退款。"]},
    },
    "refund": {
        "en": {"text": "Refunds go back to the original payment method once the return is received and checked.",
               "steps": ["Check the refund status under Orders > Refunds.",
                         "Cards and wallets usually show the money within 5-7 business days of approval.",
                         "If it has not arrived after that, contact support with your order number."]},
        "zh": {"text": "退货签收并质检通过后，退款会原路返回。",
               "steps": ["在“我的订单 > 退款”查看进度。", "审核通过后一般 5-7 个工作日到账。", "超过时间仍未到账，请带上订单号联系客服。"]},
    },
    "exchange": {
        "en": {"text": "You can exchange an item for another size or colour while it is in stock.",
               "steps": ["Open Orders and pick the item.", "Choose Exchange and select the new size or colour.",
                         "Hand the original to the courier when the replacement is delivered."]},
        "zh": {"text": "有库存时可以换尺码或颜色。",
               "steps": ["打开“我的订单”，选择该商品。", "点击“申请换货”，选择新的尺码或颜色。", "新商品送达时把原商品交给快递员。"]},
    },
    "delivery": {
        "en": {"text": "Your order's live status and courier tracking are on its order page.",
               "steps": ["Open Orders and pick the order.", "Follow the tracking link for the courier's latest scan.",
                         "If the delivery date has passed, contact support with your order number."]},
        "zh": {"text": "订单页面可以查看实时状态和物流信息。",
               "steps": ["打开“我的订单”，选择该订单。", "点击物流信息查看最新动态。", "超过预计送达时间仍未收到，请带上订单号联系客服。"]},
    },
    "cancellation": {
        "en": {"text": "An order can be cancelled until it is shipped; after that, return it instead.",
               "steps": ["Open Orders and pick the order.", "Choose Cancel and give a reason.",
                         "A prepaid amount is refunded to the original payment method."]},
        "zh": {"text": "订单发货前可以取消；已发货的请申请退货。",
               "steps": ["打开“我的订单”，选择该订单。", "点击“取消订单”并填写原因。", "已支付的金额会原路退回。"]},
    },
    "damaged": {
        "en": {"text": "Sorry about that. Damaged, defective or wrong items are replaced or refunded.",
               "steps": ["Open Orders and pick the item.", "Choose Return or Exchange with the reason 'damaged/defective'.",
                         "Add photos of the damage.", "Items under warranty: keep the invoice for the brand's service centre."]},
        "zh": {"text": "很抱歉。破损、有质量问题或发错的商品可以换货或退款。",
               "steps": ["打开“我的订单”，选择该商品。", "申请退换货，原因选“破损/质量问题”。", "上传破损处的照片。",
                         "保修期内的商品请保留发票，可到品牌售后维修。"]},
    },
    "payment": {
        "en": {"text": "A payment taken twice or without an order is reversed automatically.",
               "steps": ["Check Orders for an order placed with that payment.",
                         "Unlinked payments are reversed to the source within 5-7 business days.",
                         "If not, contact support with the transaction reference."]},
        "zh": {"text": "重复扣款或扣款未生成订单的，系统会自动退回。",
               "steps": ["在“我的订单”确认是否有对应订单。", "未生成订单的扣款会在 5-7 个工作日内原路退回。", "仍未退回的，请带上交易流水号联系客服。"]},
    },
    "wrong_item": {
        "en": {"text": "Sorry: a wrong item is picked up and replaced at no cost.",
               "steps": ["Open Orders and pick the item.", "Choose Return with the reason 'wrong item received'.",
                         "Keep the item unused for pickup."]},
        "zh": {"text": "很抱歉，发错的商品会免费上门取回并重新发货。",
               "steps": ["打开“我的订单”，选择该商品。", "申请退货，原因选“发错货”。", "请保持商品未使用，等待取件。"]},
    },
    "general": {
        "en": {"text": "Order help: returns, refunds, exchanges, delivery and payments are handled from your order page.",
               "steps": ["Open Orders and pick the order.", "Choose what you need: Return, Exchange, Cancel or Track.",
                         "Or contact support with your order number."]},
        "zh": {"text": "退货、退款、换货、物流和支付问题都可以在订单页面处理。",
               "steps": ["打开“我的订单”，选择该订单。", "选择需要的服务：退货、换货、取消或查看物流。", "也可以带上订单号联系客服。"]},
    },
}


@dataclass
class AfterSalesAnswer:
    topic: str
    text: str
    steps: list[str] = field(default_factory=list)
    language: str = "en"

    def as_dict(self) -> dict[str, Any]:
        return {"topic": self.topic, "text": self.text, "steps": list(self.steps)}


def topic_of(text: str) -> str:
    low = " ".join((text or "").casefold().split())
    for topic, cues in TOPICS:
        if any(c in low for c in cues):
            return topic
    return "general"


def answer(text: str, answers: dict[str, dict[str, dict[str, Any]]] | None = None) -> AfterSalesAnswer:
    """The after-sales answer for ``text``, in its language."""
    table = answers or ANSWERS
    topic = topic_of(text)
    lang = "zh" if _CJK.search(text or "") else "en"
    entry = table.get(topic) or table["general"]
    body = entry.get(lang) or entry["en"]
    return AfterSalesAnswer(topic, body["text"], list(body["steps"]), lang)
