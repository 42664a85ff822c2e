// Plan.g4 - grammar of .plan files (ANTLR4).
//
// A file is a list of sections. `model NAME { ... }` holds declarations and
// dataflow; `parallel { ... }` and `train { ... }` are key = value settings
// whose keys and values are checked by the semantic pass, not here, so that
// an unknown key gets a located "did you mean" error instead of a parse error.
grammar Plan;

file        : section* EOF ;

section     : modelSection
            | settingsSection
            ;

modelSection    : 'model' name=IDENT '{' modelStmt* '}' ;
settingsSection : kind=('parallel' | 'train') '{' setting* '}' ;
setting         : key=IDENT '=' expr ';'? ;

modelStmt   : role=('input' | 'label') name=IDENT ':' tensorType ';'?   # dataDecl
            | 'param' name=IDENT ':' tensorType ('=' init=expr)? ';'?   # paramDecl
            | 'loss' expr ';'?                                          # lossStmt
            | name=IDENT '=' expr ';'?                                  # letStmt
            ;

tensorType  : dtype=IDENT '[' expr (',' expr)* ']' ;

expr        : '(' expr ')'                                  # parenExpr
            | '-' expr                                      # negExpr
            | lhs=expr op=('*' | '/' | '%') rhs=expr        # mulExpr
            | lhs=expr op=('+' | '-') rhs=expr              # addExpr
            | callee=IDENT '(' (arg (',' arg)*)? ')'        # callExpr
            | IDENT                                         # nameExpr
            | NUMBER                                        # numberExpr
            | STRING                                        # stringExpr
            ;

arg         : (key=IDENT '=')? expr ;

IDENT       : [a-zA-Z_] [a-zA-Z0-9_]* ;
NUMBER      : [0-9]+ ('.' [0-9]*)? ([eE] [+-]? [0-9]+)?
            | '.' [0-9]+ ([eE] [+-]? [0-9]+)?
            ;
STRING      : '"' (~["\\\r\n] | '\\' .)* '"' ;
LINE_COMMENT  : '//' ~[\r\n]* -> skip ;
BLOCK_COMMENT : '/*' .*? '*/' -> skip ;
WS          : [ \t\r\n]+ -> skip ;
ERRCHAR     : . ;
