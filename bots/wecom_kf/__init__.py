"""WeCom 微信客服 (Kefu): WeChat customers served by the company's customer-service accounts."""
