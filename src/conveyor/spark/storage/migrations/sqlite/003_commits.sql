-- PostgreSQL's 003 records the decisions of parallel commits; SQLite has one
-- writer and commits every write in one transaction. Kept so that both lines
-- number their migrations alike.
SELECT 1;
