// Plan.g4 - grammar of .plan files (ANTLR4).
//
// A file is imports, then top-level items: constants, blocks (reusable layer
// definitions), one model, and the settings sections. Settings are
// `key = expr` pairs whose keys and values are checked by the semantic pass,
// not here, so that a misspelt key gets a located "did you mean" error rather
// than a parse error. Likewise every layer is an ordinary call; the semantic
// pass knows the built-ins.
grammar Plan;

file        : importDecl* item* EOF ;
importDecl  : 'import' path=STRING ';'? ;
item        : modelSection
            | blockDecl
            | settingsSection
            | constDecl
            ;

constDecl       : name=IDENT '=' expr ';'? ;
modelSection    : 'model' name=IDENT '{' stmt* '}' ;
blockDecl       : 'block' name=IDENT '(' (blockParam (',' blockParam)*)? ')'
                  '{' stmt* '}' ;
blockParam      : name=IDENT ':' (tensorType | kind=IDENT) ;
settingsSection : kind=('parallel' | 'train' | 'cluster') '{' setting* '}' ;
setting         : key=IDENT '=' expr ';'? ;

stmt        : role=('input' | 'label') name=IDENT ':' tensorType shardSpec? ';'?    # dataDecl
            | 'param' name=IDENT ':' tensorType ('=' init=expr)?
              ('as' exportName=STRING)? shardSpec? ';'?                         # paramDecl
            | 'loss' expr ';'?                                                  # lossStmt
            | 'return' expr ';'?                                                # returnStmt
            | name=IDENT '=' expr shardSpec? ';'?                               # letStmt
            ;

// shard(_, tp): dimension i is split over the named mesh axis, `_` = not split.
shardSpec   : 'shard' '(' shardDim (',' shardDim)* ')' ;
shardDim    : IDENT ;

tensorType  : dtype=IDENT '[' expr (',' expr)* ']' ;

expr        : '(' expr ')'                                          # parenExpr
            | '-' expr                                              # negExpr
            | lhs=expr op=('*' | '/' | '%') rhs=expr                # mulExpr
            | lhs=expr op=('+' | '-') rhs=expr                      # addExpr
            | 'repeat' '(' count=expr ')' callee=IDENT
              '(' (arg (',' arg)*)? ')' ('as' prefix=STRING)?       # repeatExpr
            | callee=IDENT '(' (arg (',' arg)*)? ')'                # callExpr
            | '[' (expr (',' expr)*)? ']'                           # listExpr
            | IDENT                                                 # nameExpr
            | NUMBER                                                # numberExpr
            | STRING                                                # stringExpr
            ;

arg         : (key=IDENT '=')? expr ;

// NUMBER comes first so that `1e5` is a number; names may start with
// digits (`1f1b`, a pipeline schedule) when a letter follows.
NUMBER      : [0-9]+ ('.' [0-9]*)? ([eE] [+-]? [0-9]+)?
            | '.' [0-9]+ ([eE] [+-]? [0-9]+)?
            ;
IDENT       : [a-zA-Z_] [a-zA-Z0-9_]*
            | [0-9]+ [a-zA-Z_] [a-zA-Z0-9_]*
            ;
STRING      : '"' (~["\\\r\n] | '\\' .)* '"' ;
LINE_COMMENT  : '//' ~[\r\n]* -> skip ;
BLOCK_COMMENT : '/*' .*? '*/' -> skip ;
WS          : [ \t\r\n]+ -> skip ;
ERRCHAR     : . ;
